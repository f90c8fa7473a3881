"""The examples/ and training/ recipes."""
