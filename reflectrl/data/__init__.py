"""SFT data for both players: expert episodes with negative examples, written as prompt /
completion rows with exactly the prompts RL uses (`reflectrl.text.rendering`)."""
