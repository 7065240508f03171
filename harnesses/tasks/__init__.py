"""Task sources: reasoning-gym datasets, the user's data files, two-player games, synthetic and story tasks."""
