"""The keras-hub backbone families with attention that `from_keras_hub`
does not convert, each with its reason: the one list the error message,
the docs ("Families not converted" in the pretrained-models guide) and
their test read.

Two kinds of reason. Some families cannot be written as this library's
blocks of dot-product attention at all; the others could be and are not
built yet, and the reason names what is missing, so that a user knows
what a converter would take. Families without attention (convolutional
networks, VAEs) are not listed.
"""

CANNOT = "cannot be expressed"
NOT_YET = "not built yet"

# keras-hub backbone class name -> (kind, reason).
REFUSED_BACKBONES = {
    "BLIP2Backbone": (
        NOT_YET,
        "a vision tower, a Q-Former of learned queries cross-attending to "
        "it, and an OPT decoder fed its outputs as a prefix: the towers "
        "exist, the Q-Former's wiring does not",
    ),
    "DFineBackbone": (
        CANNOT,
        "deformable attention: each query samples a few bilinear points "
        "at learned offsets instead of scoring keys, which is not "
        "dot-product attention over a key set",
    ),
    "DINOV3Backbone": (
        NOT_YET,
        "2-D rotary positions over the patch grid (row and column "
        "frequencies per head) with its random jitter of coordinates",
    ),
    "DepthAnythingBackbone": (
        NOT_YET,
        "a DINOv2 encoder (converted alone by `DINOV2Backbone`) feeding a "
        "convolutional DPT head, which is not attention",
    ),
    "EdRecBackbone": (
        NOT_YET,
        "its encoder-decoder blocks (simple RMS norms, separate layer "
        "counts) have no converter; nothing in them is missing from the "
        "library",
    ),
    "FluxBackbone": (
        NOT_YET,
        "a diffusion transformer: joint (MMDiT) attention over text and "
        "image tokens inside single- and double-stream blocks with "
        "modulation by the timestep",
    ),
    "Gemma3nBackbone": (
        NOT_YET,
        "AltUp's predicted and corrected streams, LAuReL, per-layer "
        "embeddings, keys and values shared across layers, and the "
        "audio and MobileNet-v5 towers",
    ),
    "MiTBackbone": (
        NOT_YET,
        "SegFormer's efficient attention: keys and values downsampled "
        "by a strided convolution (spatial reduction) and Mix-FFN's "
        "depthwise convolution",
    ),
    "MobileNetV5Backbone": (
        NOT_YET,
        "a convolutional network with mobile multi-query attention "
        "blocks (downsampled keys and values over a feature map)",
    ),
    "PARSeqBackbone": (
        NOT_YET,
        "a ViT encoder and a decoder trained with permuted "
        "autoregressive masks (one mask per sampled permutation)",
    ),
    "PaliGemmaBackbone": (
        NOT_YET,
        "a SigLIP tower and a Gemma decoder under a prefix-LM mask "
        "(bidirectional over the image and prompt): both parts exist, "
        "the multimodal wiring does not",
    ),
    "RWKV7Backbone": (
        CANNOT,
        "RWKV-7's time mixing is a recurrence with its own token shift "
        "and state update; there is no attention to convert",
    ),
    "SAM3PromptableConceptBackbone": (
        NOT_YET,
        "a DETR-like detector with a text and a geometry encoder around "
        "a windowed ViT; none of its heads is built",
    ),
    "SAMBackbone": (
        NOT_YET,
        "ViTDet's windowed attention with decomposed relative positions "
        "and a two-way transformer mask decoder",
    ),
    "SegFormerBackbone": (
        NOT_YET,
        "the MiT encoder (see `MiTBackbone`) and an MLP decoder",
    ),
    "StableDiffusion3Backbone": (
        NOT_YET,
        "a diffusion transformer (MMDiT) with a VAE and CLIP/T5 text "
        "encoders: joint attention with timestep modulation",
    ),
    "SwinTransformerBackbone": (
        NOT_YET,
        "shifted windows with a cyclic shift and a learned relative "
        "position bias table per window size",
    ),
    "T5Gemma2Backbone": (
        NOT_YET,
        "the decoder's merged attention: one softmax over its own keys "
        "and the encoder's together, and a vision encoder",
    ),
    "VideoPrismBackbone": (
        NOT_YET,
        "a factorized video transformer: spatial then temporal "
        "attention over patch tubes",
    ),
    "ViTDetBackbone": (
        NOT_YET,
        "windowed attention with decomposed relative positions (a "
        "height and a width table added to the scores)",
    ),
    "XLNetBackbone": (
        CANNOT,
        "two-stream attention: a query stream that sees a position but "
        "not its content beside the content stream, over permutation "
        "masks with relative segment encodings; one block computes one "
        "stream",
    ),
}


def refusal_reason(class_names):
    """The sentence `from_keras_hub` adds for a refused family: for the
    first of `class_names` (a backbone's class and its bases) that is
    listed, else ""."""
    for name in class_names:
        if name in REFUSED_BACKBONES:
            kind, reason = REFUSED_BACKBONES[name]
            return f" {name} is not converted ({kind}): {reason}."
    return ""
