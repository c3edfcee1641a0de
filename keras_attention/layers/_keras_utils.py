# TRANSITIONAL shim during the issue-11 redesign; removed before it lands.
from keras_attention.utils.keras_utils import keras_mask  # noqa: F401
