"""Entry point for `ray submit cluster/config.yaml cluster/train.py [launch options]`.

Runs on the head node and joins the cluster that `ray up` started (address "auto").
"""

import sys
from pathlib import Path

# `ray submit` copies this file into the head's home folder, next to the repository's folder
# `~/reflectrl`, which Python would import as the package instead of the installed one.
HERE = Path(__file__).resolve().parent
sys.path = [p for p in sys.path if Path(p or ".").resolve() != HERE]

from reflectrl.cli import main  # noqa: E402

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--address" not in args:
        args = ["--address", "auto", *args]
    sys.exit(main(["launch", *args]))
