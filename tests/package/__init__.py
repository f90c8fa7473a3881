"""The installed package, its wheel build and the documentation's code blocks."""
