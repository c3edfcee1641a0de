"""The tiny Hugging Face configs of `from_huggingface`'s tests and of
`tools/interop_equality.py --huggingface`, in one place: one case per
family (a `model_type` and its `config.json` fields), each family's
distinctive options on. `hf_reference.py` builds the transformers model
of a case from them (random weights, `torch.manual_seed`), saves it and
writes its outputs; the tests and the tool convert the saved checkpoint
and compare. No transformers import here: the TensorFlow process reads
this module too."""

VOCAB = 24
NEW_TOKENS = 8  # greedy tokens generated per prompt
# A batch of 2 x 8: row 0 right-padded (5 real tokens), row 1 left-padded
# (6 real tokens); padding id 0.
TOKEN_IDS = (
    (5, 7, 9, 3, 11, 0, 0, 0),
    (0, 0, 4, 8, 15, 2, 6, 13),
)
PADDING_MASK = (
    (1, 1, 1, 1, 1, 0, 0, 0),
    (0, 0, 1, 1, 1, 1, 1, 1),
)
# Prompts of the greedy comparison (unpadded; our generator pads them
# on the right, transformers generates each alone).
PROMPTS = ((5, 7, 9), (3, 4, 11, 12, 13))

# The fields most tiny configs share: 2 layers, hidden size 16, 4 query
# heads of 8 (an explicit `head_dim` other than hidden / heads), 2
# key/value heads; `initializer_range` large enough, with the noise
# `hf_reference.py` adds to every weight (norm scales included), for
# varied greedy tokens.
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    initializer_range=0.5,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=None,
)

CASES = {
    # Llama 3.1's RoPE scaling over a pretraining length of 8 (both of
    # its frequency bands and the smoothed one for head_dim 8), biases on
    # the attention and feed-forward projections, an untied head.
    "llama": dict(
        model_type="llama",
        config=dict(
            COMMON,
            rms_norm_eps=1e-5,
            attention_bias=True,
            mlp_bias=True,
            tie_word_embeddings=False,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=10000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=8,
            ),
        ),
    ),
}


def case_names():
    """The case names, sorted."""
    return sorted(CASES)
