"""costmodel."""
