"""`python -m examples.classify_images`: a vision transformer (or 2-D
attention over a conv feature map) classifying images, with attention maps
and attention rollout drawn on the images (see `__main__.py`)."""

__all__ = []
