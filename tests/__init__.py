"""The test suite, one folder per layer of the package; ``tests.helpers`` holds what several test modules share."""
