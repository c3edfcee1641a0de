"""Reads back the attention images `AttentionTensorBoard` writes (shared by
the callback's tests and the examples' tests)."""

import glob
import os


def read_attention_images(log_dir):
    """`{(tag, step): uint8 image (H, W, C)}` of every image summary in
    `<log_dir>/attention`."""
    import tensorflow as tf

    images = {}
    pattern = os.path.join(log_dir, "attention", "events.out.tfevents.*")
    for path in glob.glob(pattern):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name != "images":
                    continue
                # tf.summary.image: [width, height, PNG...] strings.
                encoded = tf.make_ndarray(value.tensor)[2]
                image = tf.io.decode_png(encoded).numpy()
                images[(value.tag, event.step)] = image
    return images


def attention_image_tags(output_dir):
    """Tags of the attention images of an example's `<output_dir>/logs`."""
    logs = os.path.join(output_dir, "logs")
    return {tag for tag, _ in read_attention_images(logs)}
