"""Build tiny random-weight checkpoints of the scripts' real architectures, for the engine tests.

    ENGINE_PYTHON tests/tiny_models.py qwen3_5 OUT_DIR
    ENGINE_PYTHON tests/tiny_models.py qwen2_vl OUT_DIR

Runs inside the CPU vLLM environment (it needs torch and transformers). No weights can be
downloaded here, so each checkpoint is a config + random init + save_pretrained, a byte-level
BPE tokenizer trained on a few sentences with the architecture's special tokens, a chat
template, and the image processor's config. Random weights are scaled up so that different
pages give different text (the engine tests assert it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                  "<|vision_end|>", "<|image_pad|>", "<|video_pad|>", "<think>", "</think>",
                  "<td>", "</td>"]

# Qwen-style chat template: image parts become vision tokens; `enable_thinking=False` closes
# an empty think block, as the real Qwen3.5 template does.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|im_start|>{{ message['role'] }}\n"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] in ['image', 'image_url'] -%}<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}<|im_end|>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false -%}<think>\n\n</think>\n\n"
    "{%- endif -%}{%- endif -%}"
)

CORPUS = [
    "Extract all readable content from the image in natural human reading order.",
    "Convert the document to markdown. OCR this image. Free OCR. Parse the figure.",
    "# Title\n\nA paragraph of text with numbers 0123456789 and a table <table><tr><td>1</td></tr></table>.",
    "document parsing with fork. document parsing. grounding",
    "The quick brown fox jumps over the lazy dog. $E = mc^2$ and \\frac{a}{b}.",
]


def build_tokenizer(out: Path, vocab_size: int = 400):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def scale_weights(model, factor: float, seed: int, vision_factor: float | None = None) -> None:
    """Random weights, but large enough that the output depends on the input; the vision
    tower louder still, so that the page, not the prompt, decides the text."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                gain = vision_factor if vision_factor and "visual" in name else factor
                param.copy_(torch.randn(param.shape, generator=generator) * gain / param.shape[-1] ** 0.5)


def vision_token_ids(ids: dict) -> dict:
    """The config entries that tie the vision tokens to the tokenizer's ids."""
    return {"image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
            "vision_start_token_id": ids["<|vision_start|>"],
            "vision_end_token_id": ids["<|vision_end|>"], "tie_word_embeddings": False}


def image_processor_config(processor_class: str, patch: int, merge: int) -> dict:
    return {
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": processor_class,
        "patch_size": patch, "merge_size": merge, "temporal_patch_size": 2,
        "min_pixels": 56 * 56, "max_pixels": 2880 * 2880,
        "size": {"shortest_edge": 56 * 56, "longest_edge": 2880 * 2880},
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True,
        "resample": 3, "rescale_factor": 1 / 255,
    }


def build_qwen3_5(out: Path, seed: int = 0, scale: float = 1.0, vision_scale: float = 24.0) -> None:
    """Qwen3_5ForConditionalGeneration: the architecture of OvisOCR2 and LightOnOCR-3-0.8B."""
    import torch
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    vocab = len(tok)
    text = {
        "vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"],
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
        "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_num_key_heads": 1, "linear_num_value_heads": 1, "linear_conv_kernel_dim": 4,
        "max_position_embeddings": 32768,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                            "partial_rotary_factor": 0.25, "mrope_section": [2, 3, 3],
                            "mrope_interleaved": True},
        "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"],
        "tie_word_embeddings": False, "dtype": "float32",
    }
    vision = {"depth": 1, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2,
              "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
              "out_hidden_size": 64, "num_position_embeddings": 2304}
    config = Qwen3_5Config(text_config=text, vision_config=vision, **vision_token_ids(ids))
    config.dtype = "float32"
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(config)
    scale_weights(model, scale, seed, vision_scale)
    model.save_pretrained(out, safe_serialization=True)
    (out / "preprocessor_config.json").write_text(
        json.dumps(image_processor_config("Qwen3VLProcessor", 16, 2), indent=2))
    (out / "video_preprocessor_config.json").write_text(json.dumps(
        {**image_processor_config("Qwen3VLProcessor", 16, 2),
         "video_processor_type": "Qwen3VLVideoProcessor"}, indent=2))
    _generation_config(out, ids)


def build_qwen2_vl(out: Path, seed: int = 0) -> None:
    """Qwen2VLForConditionalGeneration: the stand-in where a script's own architecture cannot
    run here (HPD-Parsing's fork, DeepSeek-OCR's payload path)."""
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    # DeepSeek's vocabulary size, so that real token ids in a payload (the n-gram processor's
    # whitelist 128821, 128822) are valid ids of the stand-in too
    text = {"vocab_size": 129280, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
            "max_position_embeddings": 32768,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                "mrope_section": [4, 6, 6]},  # head_dim 32: rotary 32, sections sum to 16
            "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"],
            "bos_token_id": None}
    vision = {"depth": 1, "embed_dim": 64, "hidden_size": 64, "num_heads": 2, "mlp_ratio": 2,
              "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}
    config = Qwen2VLConfig(text_config=text, vision_config=vision, **vision_token_ids(ids))
    config.dtype = "float32"
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config)
    scale_weights(model, 1.0, seed, 24.0)
    with torch.no_grad():  # ids past the tokenizer's 400 would detokenize to nothing
        model.lm_head.weight[len(tok):] = 0.0
    model.save_pretrained(out, safe_serialization=True)
    (out / "preprocessor_config.json").write_text(
        json.dumps(image_processor_config("Qwen2VLProcessor", 14, 2), indent=2))
    _generation_config(out, ids)


def build_glm_ocr(out: Path, seed: int = 0) -> None:
    """GlmOcrForConditionalGeneration with its MTP layer (vLLM's GlmOcrMTPModel drafts from
    it), so the engine serves glm-ocr-server.py's real speculative config.

    The MTP layer is what the real checkpoint stores after its decoder layers (transformers
    ignores `model.language_model.layers.<num_hidden_layers>.*` on load, and vLLM's MTP model
    loads exactly those): one decoder layer plus the two input norms, the projection of
    [embedding, hidden state] and the shared head's norm. transformers does not build it, so
    its tensors are added to the saved weights here. Special tokens, image token ids and the
    processor are GLM's (Glm46VProcessor, 14 px patches merged 2x2, two frames per image,
    MODEL-FACTS' pixel bounds)."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import GlmOcrConfig, GlmOcrForConditionalGeneration

    out.mkdir(parents=True, exist_ok=True)
    glm_tokens = ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>",
                  "<|begin_of_image|>", "<|end_of_image|>", "<|image|>", "<|begin_of_video|>",
                  "<|end_of_video|>", "<|video|>"]
    tok = build_tokenizer(out)
    tok.add_special_tokens({"additional_special_tokens": glm_tokens})
    tok.eos_token = "<|endoftext|>"
    # GLM's turn layout: the image parts as the processor's placeholder, then the text
    tok.chat_template = (
        "[gMASK]<sop>{%- for message in messages -%}<|{{ message['role'] }}|>\n"
        "{%- if message['content'] is string -%}{{ message['content'] }}"
        "{%- else -%}{%- for part in message['content'] -%}"
        "{%- if part['type'] in ['image', 'image_url'] -%}<|begin_of_image|><|image|><|end_of_image|>"
        "{%- elif part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
        "{%- endfor -%}{%- endif -%}{%- endfor -%}"
        "{%- if add_generation_prompt -%}<|assistant|>\n{%- endif -%}")
    tok.save_pretrained(out)
    ids = {t: tok.convert_tokens_to_ids(t) for t in glm_tokens + ["<|endoftext|>"]}
    hidden, layers = 64, 1
    text = {"vocab_size": len(tok), "hidden_size": hidden, "intermediate_size": 128,
            "num_hidden_layers": layers, "num_attention_heads": 2, "num_key_value_heads": 1,
            "num_nextn_predict_layers": 1, "max_position_embeddings": 32768,
            # head_dim 32, half of it rotary: the three mrope sections sum to 8
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                "partial_rotary_factor": 0.5, "mrope_section": [2, 3, 3]},
            "eos_token_id": [ids["<|endoftext|>"], ids["<|user|>"]],
            "pad_token_id": ids["<|endoftext|>"]}
    vision = {"depth": 1, "hidden_size": 64, "num_heads": 2, "intermediate_size": 128,
              "out_hidden_size": hidden, "patch_size": 14, "spatial_merge_size": 2,
              "temporal_patch_size": 2}
    config = GlmOcrConfig(
        text_config=text, vision_config=vision, image_token_id=ids["<|image|>"],
        video_token_id=ids["<|video|>"], image_start_token_id=ids["<|begin_of_image|>"],
        image_end_token_id=ids["<|end_of_image|>"], video_start_token_id=ids["<|begin_of_video|>"],
        video_end_token_id=ids["<|end_of_video|>"], tie_word_embeddings=False)
    config.dtype = "float32"
    torch.manual_seed(seed)
    model = GlmOcrForConditionalGeneration(config)
    scale_weights(model, 1.0, seed, 24.0)
    with torch.no_grad():  # random weights must not stop the answer before max_tokens
        for stop in text["eos_token_id"]:
            model.lm_head.weight[stop] = 0.0
    model.save_pretrained(out, safe_serialization=True)
    weights_file = out / "model.safetensors"
    weights = load_file(weights_file)
    generator = torch.Generator().manual_seed(seed + 1)
    first, mtp = "model.language_model.layers.0.", f"model.language_model.layers.{layers}."
    weights.update({mtp + name[len(first):]: tensor.clone()
                    for name, tensor in weights.items() if name.startswith(first)})
    weights.update({
        mtp + "enorm.weight": torch.ones(hidden), mtp + "hnorm.weight": torch.ones(hidden),
        mtp + "shared_head.norm.weight": torch.ones(hidden),
        mtp + "eh_proj.weight": torch.randn(hidden, 2 * hidden, generator=generator) / (2 * hidden) ** 0.5})
    save_file(weights, weights_file, metadata={"format": "pt"})
    processor = {
        "image_processor_type": "Glm46VImageProcessor", "processor_class": "Glm46VProcessor",
        "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2,
        "size": {"shortest_edge": 12544, "longest_edge": 9633792},
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True,
        "resample": 3, "rescale_factor": 1 / 255}
    (out / "preprocessor_config.json").write_text(json.dumps(processor, indent=2))
    (out / "video_preprocessor_config.json").write_text(json.dumps(
        {**processor, "video_processor_type": "Glm46VVideoProcessor"}, indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": text["eos_token_id"], "pad_token_id": ids["<|endoftext|>"]}))


def _generation_config(out: Path, ids: dict) -> None:
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"]}))


BUILDERS = {
    "qwen3_5": build_qwen3_5,
    # small weights: the logits barely depend on the input, so every page comes back as one
    # token over and over: a real degenerate engine for the degenerate-output check
    "qwen3_5_flat": lambda out: build_qwen3_5(out, scale=0.02, vision_scale=0.02),
    "qwen2_vl": build_qwen2_vl,
    "glm_ocr": build_glm_ocr,
}

if __name__ == "__main__":
    kind, target = sys.argv[1], Path(sys.argv[2])
    BUILDERS[kind](target)
    print(target)
