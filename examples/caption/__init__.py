"""Image captioning with visual attention: `python -m examples.caption`
(see `__main__.py`)."""
