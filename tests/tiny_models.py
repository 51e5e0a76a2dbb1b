"""Build tiny random-weight checkpoints of the scripts' real architectures, for the engine tests.

    ENGINE_PYTHON tests/tiny_models.py qwen3_5 OUT_DIR
    ENGINE_PYTHON tests/tiny_models.py qwen2_vl OUT_DIR
    ENGINE_PYTHON tests/tiny_models.py qwen2_5_vl OUT_DIR

Runs inside the CPU vLLM environment (it needs torch and transformers). No weights can be
downloaded here, so each checkpoint is a config + random init + save_pretrained, a byte-level
BPE tokenizer trained on a few sentences with the architecture's special tokens, a chat
template, and the image processor's config. Random weights are scaled up so that different
pages give different text (the engine tests assert it).

Making one for a new architecture (a `build_<name>(out)` and its BUILDERS entry):

* Config: the architecture's own config class from the engine's transformers
  (ENGINE_PYTHON's site-packages, transformers/models/<name>/configuration_*.py), at the
  smallest sizes vLLM's CPU engine takes: 1-2 layers, hidden 64, vision depth 1, attention head
  dim at least 32 (16 kills the engine at its first request); Qwen3.5's linear attention needs
  key and value head dims 128. The ids of the image and special tokens come from the tokenizer
  built here (vision_token_ids), and `config.architectures` must name the class vLLM registers.
  Read vLLM's model file (vllm/model_executor/models/<name>.py) first: a tower it builds at a
  size fixed in code, whatever the config says (DeepSeek-OCR's SAM and CLIP-L, DeepSeek-OCR-2's
  SAM and 24-layer Qwen2 encoder), makes the checkpoint big and each page slow: then keep its
  engine case to a few pages, or stand in with the closest architecture that can be tiny and say
  why in tests/test_engine.py's ENGINE_CASES.
* Weights: random init, scale_weights, save_pretrained(safe_serialization=True). They must carry
  the names vLLM's load_weights expects (its hf_to_vllm_mapper): where transformers' class names
  them otherwise, save a state dict of the expected names and shapes yourself.
* Tokenizer and chat template: build_tokenizer, whose SPECIAL_TOKENS hold the Qwen-style vision
  tokens; a model whose processor looks for other tokens (`<image>`) needs them added in its
  own builder, and a chat template that puts them where the model's template does.
* Processor: preprocessor_config.json (image_processor_config: patch size, merge size, the
  processor class vLLM loads; a Qwen3-VL processor also wants video_preprocessor_config.json)
  and generation_config.json (_generation_config).
* Draft layers for speculative decoding (an MTP head): the config's count of them
  (`num_nextn_predict_layers` or the architecture's name for it) and their weights under the
  names vLLM's draft model loads (its <name>_mtp.py); where the CPU engine cannot run the
  draft, the engine case drops the flag instead (tests/test_engine.py) and says why.
* Try it by hand: ENGINE_PYTHON tests/tiny_models.py <kind> /tmp/tiny, then `vllm serve
  /tmp/tiny` with the script's SERVE_ARGS in engine_env.engine_environ()'s environment.

tests/engine.py's tiny_model(kind) caches each checkpoint under ~/.cache/ocr-vllm-engine/
tiny-models/<kind>-<digest>, keyed by builder_source(kind): this file's shared statements
(not this docstring) and the build_* functions its BUILDERS entry reaches. A new or edited
builder rebuilds only its own checkpoints; an edit of a shared statement (SPECIAL_TOKENS,
CORPUS, build_tokenizer...) rebuilds every one, so put what one architecture needs in its
builder.
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


def build_paddleocr_vl(out: Path, seed: int = 0) -> None:
    """PaddleOCRVLForConditionalGeneration (transformers' and vLLM's own classes): an ERNIE-4.5
    text model behind a SigLIP-style vision tower, 14 px patches merged 2 x 2, the vendor's 1.6
    chat template (MODEL-FACTS, PaddleOCR-VL, "Serve", [PX-genai-tmpl-1.6]) and a processor
    whose defaults are smaller than the script's bounds, so a page keeps its size only if the
    per-request min_pixels / max_pixels reach the processor."""
    import torch
    from transformers import (AutoTokenizer, PaddleOCRVLConfig,
                              PaddleOCRVLForConditionalGeneration)

    out.mkdir(parents=True, exist_ok=True)
    image_tokens = ["<|IMAGE_START|>", "<|IMAGE_PLACEHOLDER|>", "<|IMAGE_END|>",
                    "<|begin_of_sentence|>", "<|video_pad|>"]
    build_tokenizer(out).add_tokens(image_tokens, special_tokens=True)
    tok = AutoTokenizer.from_pretrained(
        out, extra_special_tokens={"image_token": "<|IMAGE_PLACEHOLDER|>"})
    tok.add_tokens(image_tokens, special_tokens=True)
    tok.chat_template = (
        "{%- for message in messages -%}"
        "{%- if message['role'] == 'user' -%}<|begin_of_sentence|>User: "
        "{%- if message['content'] is string -%}{{ message['content'] }}"
        "{%- else -%}{%- for part in message['content'] -%}"
        "{%- if part['type'] in ['image', 'image_url'] -%}"
        "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>"
        "{%- elif part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
        "{%- endfor -%}{%- endif -%}\n"
        "{%- else -%}Assistant:\n{{ message['content'] }}<|im_end|>{%- endif -%}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}Assistant:\n{%- endif -%}")
    tok.save_pretrained(out)
    ids = {t: tok.convert_tokens_to_ids(t) for t in [*SPECIAL_TOKENS, *image_tokens]}
    text = {"vocab_size": len(tok), "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 32, "max_position_embeddings": 32768,
            "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0,
                                "mrope_section": [4, 6, 6]},
            "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"],
            "bos_token_id": ids["<|begin_of_sentence|>"], "tie_word_embeddings": False}
    vision = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
              "num_attention_heads": 2, "image_size": 384, "patch_size": 14,
              "spatial_merge_size": 2}
    config = PaddleOCRVLConfig(
        text_config=text, vision_config=vision, tie_word_embeddings=False,
        image_token_id=ids["<|IMAGE_PLACEHOLDER|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|IMAGE_START|>"], vision_end_token_id=ids["<|IMAGE_END|>"])
    config.dtype = "float32"
    torch.manual_seed(seed)
    model = PaddleOCRVLForConditionalGeneration(config)
    scale_weights(model, 1.0, seed, 24.0)
    model.save_pretrained(out, safe_serialization=True)
    # The Hub repo's processor is remote code, which `--trust-remote-code` loads; vLLM then reads
    # its bounds as `max_pixels` and size["min_pixels"] / size["max_pixels"] (vLLM 0.32
    # paddleocr_vl.py, "Defined in HF Hub repo"). Not downloadable here: this stand-in gives
    # transformers' own processor that interface, and is loaded the same way (auto_map).
    (out / "hub_style_processor.py").write_text(
        "from transformers.image_utils import SizeDict\n"
        "from transformers.models.paddleocr_vl.image_processing_paddleocr_vl import (\n"
        "    PaddleOCRVLImageProcessor)\n\n\n"
        "class HubStylePaddleOCRVLImageProcessor(PaddleOCRVLImageProcessor):\n"
        "    def __init__(self, min_pixels, max_pixels, **kwargs):\n"
        "        super().__init__(min_pixels=min_pixels, max_pixels=max_pixels, **kwargs)\n"
        "        self.min_pixels, self.max_pixels = min_pixels, max_pixels\n"
        "        self.size = SizeDict(shortest_edge=min_pixels, longest_edge=max_pixels,\n"
        "                             min_pixels=min_pixels, max_pixels=max_pixels)\n")
    (out / "preprocessor_config.json").write_text(json.dumps({
        "auto_map": {"AutoImageProcessor": "hub_style_processor.HubStylePaddleOCRVLImageProcessor"},
        "image_processor_type": "HubStylePaddleOCRVLImageProcessor",
        "processor_class": "PaddleOCRVLProcessor",
        "patch_size": 14, "merge_size": 2, "temporal_patch_size": 1,
        "min_pixels": 56 * 56, "max_pixels": 448 * 448,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "resample": 3}, indent=2))
def build_qwen2_5_vl(out: Path, seed: int = 0) -> None:
    """Qwen2_5_VLForConditionalGeneration: the architecture of olmOCR-2 (a Qwen2.5-VL-7B
    fine-tune). The vision tower's windowed attention needs a window and a full-attention
    layer: one layer, full attention, windows of 112 px (8 patches of 14)."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    text = {"vocab_size": len(tok), "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
            "max_position_embeddings": 32768,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                                "mrope_section": [4, 6, 6]},  # head_dim 32: sections sum to 16
            "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"],
            "bos_token_id": None}
    vision = {"depth": 1, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2,
              "out_hidden_size": 64, "patch_size": 14, "spatial_merge_size": 2,
              "temporal_patch_size": 2, "window_size": 112, "fullatt_block_indexes": [0]}
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, **vision_token_ids(ids))
    config.dtype = "float32"
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config)
    scale_weights(model, 1.0, seed, 24.0)
    model.save_pretrained(out, safe_serialization=True)
    (out / "preprocessor_config.json").write_text(
        json.dumps(image_processor_config("Qwen2_5_VLProcessor", 14, 2), indent=2))
def build_dots_ocr(out: Path, seed: int = 0) -> None:
    """DotsOCRForCausalLM (dots.mocr): vLLM's own model class, its Qwen2 language model and its
    vision tower. transformers has no dots_ocr classes, and vLLM maps no model_type to its own
    DotsOCRConfig: the real checkpoints carry that config as remote code, so this one does
    too, a module that re-exports vLLM's class (it is what `--trust-remote-code` loads). The
    language model's weights come from transformers' Qwen2; the vision tower's are drawn here,
    named as in the real checkpoint (vLLM's loader maps them and refuses any it lacks)."""
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out)
    image_tokens = ["<|img|>", "<|imgpad|>", "<|endofimg|>"]
    tok.add_special_tokens({"additional_special_tokens": image_tokens})
    # the checkpoint's template takes string content (hence --chat-template-content-format
    # string): a list of parts would be printed as a list
    tok.chat_template = ("{%- for m in messages -%}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                         "<|im_end|>\n{%- endfor -%}"
                         "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}")
    tok.save_pretrained(out)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS + image_tokens}
    text = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                       max_position_embeddings=32768, rope_theta=10000.0,
                       eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
                       bos_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(seed)
    language_model = Qwen2ForCausalLM(text)
    scale_weights(language_model, 1.0, seed)
    embed, inner, merged = 64, 128, 64 * 4  # the vision tower: one block, 2 heads of 32
    generator = torch.Generator().manual_seed(seed + 1)

    def drawn(*shape):
        return torch.randn(*shape, generator=generator) * 24.0 / shape[-1] ** 0.5

    ones = torch.ones
    vision = {
        "patch_embed.patchifier.proj.weight": drawn(embed, 3, 14, 14),
        "patch_embed.patchifier.proj.bias": torch.zeros(embed),
        "patch_embed.patchifier.norm.weight": ones(embed),
        "blocks.0.norm1.weight": ones(embed), "blocks.0.norm2.weight": ones(embed),
        "blocks.0.attn.qkv.weight": drawn(3 * embed, embed),
        "blocks.0.attn.proj.weight": drawn(embed, embed),
        "blocks.0.mlp.fc1.weight": drawn(inner, embed), "blocks.0.mlp.fc3.weight": drawn(inner, embed),
        "blocks.0.mlp.fc2.weight": drawn(embed, inner),
        "post_trunk_norm.weight": ones(embed),
        "merger.ln_q.weight": ones(embed), "merger.ln_q.bias": torch.zeros(embed),
        "merger.mlp.0.weight": drawn(merged, merged), "merger.mlp.0.bias": torch.zeros(merged),
        "merger.mlp.2.weight": drawn(64, merged), "merger.mlp.2.bias": torch.zeros(64),
    }
    weights = {name: tensor.contiguous() for name, tensor in language_model.state_dict().items()}
    weights.update({f"vision_tower.{name}": tensor.contiguous() for name, tensor in vision.items()})
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = {**text.to_dict(), "architectures": ["DotsOCRForCausalLM"], "model_type": "dots_ocr",
              "auto_map": {"AutoConfig": "configuration_dots.DotsOCRConfig"},
              "image_token_id": ids["<|imgpad|>"], "video_token_id": ids["<|video_pad|>"],
              "dtype": "float32",
              "vision_config": {"embed_dim": embed, "hidden_size": 64, "intermediate_size": inner,
                                "num_hidden_layers": 1, "num_attention_heads": 2,
                                "patch_size": 14, "spatial_merge_size": 2,
                                "temporal_patch_size": 1, "use_bias": False, "post_norm": True}}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "configuration_dots.py").write_text(
        "from vllm.transformers_utils.configs.dotsocr import DotsOCRConfig, DotsVisionConfig\n\n"
        "__all__ = [\"DotsOCRConfig\", \"DotsVisionConfig\"]\n")
    # the processor's floor as the authors' constants give it (3,136 px), its ceiling lower
    # than their 11,289,600: vLLM profiles the encoder at the ceiling at start-up, and 14,400
    # image tokens (57,600 patches through full attention) took 3.3 minutes of a loaded
    # 2-core machine; the test pages (under 0.4 MP) are resized alike under either ceiling
    (out / "preprocessor_config.json").write_text(json.dumps(
        {**image_processor_config("Qwen2VLProcessor", 14, 2), "temporal_patch_size": 1,
         "min_pixels": 3136, "max_pixels": 1003520,
         "size": {"shortest_edge": 3136, "longest_edge": 1003520}}, indent=2))
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
    "paddleocr_vl": build_paddleocr_vl,
    "qwen2_5_vl": build_qwen2_5_vl,
    "dots_ocr": build_dots_ocr,
    "glm_ocr": build_glm_ocr,
}

if __name__ == "__main__":
    kind, target = sys.argv[1], Path(sys.argv[2])
    BUILDERS[kind](target)
    print(target)
