"""`python -m keras_posenc_cli`: the export job from any folder (as `keras-posenc-export`).

`python -m export` names the repository's `export/` folder, so it runs only from the
repository root; this module is installed with the package.
"""

from keras_posenc_cli import main

raise SystemExit(main(prog="python -m keras_posenc_cli"))
