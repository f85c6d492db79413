"""ALFWorld: the alfworld engine over games generated offline from the package's own layouts
(`reflectrl alfworld-gen`) or over the official data. Importing `reflectrl.envs.alfworld.env`
registers the `alfworld` env; the engine itself (textworld) is only imported at an env's first
reset.

This `__init__` imports nothing: its modules take each other's names (`from
reflectrl.envs.alfworld import catalog`), and a package that imported its env here would run
env -> generator -> scene -> this package -> env (tests/test_import_contracts.py)."""
