"""What several test modules share: dense definitions, GPU kernel paths, forward checks, model and sample
builders. Imported as ``tests.helpers.<module>``."""
