# TRANSITIONAL shim during the issue-11 redesign; removed before it lands.
from keras_attention.utils.keras_utils import clone_initializer  # noqa: F401
from keras_attention.utils.validation import *  # noqa: F401,F403
