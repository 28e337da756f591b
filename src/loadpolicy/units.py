"""Units the reports share."""

GIB = 1024**3
