"""Positions, rows and tables: which positions a call covers, which rows of the shared
table serve them, grids of positions, and the layouts of RoPE's rows."""
