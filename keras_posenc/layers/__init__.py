"""The layers (`keras_posenc.X`) and the private helpers of their calls: one layer per module."""
