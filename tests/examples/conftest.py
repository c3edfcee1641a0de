"""The examples are programs in the repository, not an installed package:
their tests import them from the repository root, as
`python -m examples.<name>` does from there."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
