"""`python -m export`: export and verify the default encoders (or `--model PATH.keras`)."""

from keras_posenc.export.cli import main

raise SystemExit(main())
