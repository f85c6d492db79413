"""Warm-up SFT of both players on the data of `reflectrl data` (TRL's SFTTrainer + peft)."""
