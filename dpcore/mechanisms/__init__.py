"""Release mechanisms (torch; CUDA when available, else CPU)."""
