"""`python -m export`: export and verify the default encoders (or `--model PATH.keras`)."""

from keras_posenc_cli import main

raise SystemExit(main(prog="python -m export"))
