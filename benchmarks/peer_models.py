"""The peer benchmark's models in PyTorch, with the same weights as their ONNX files.

ResNet-50, ViT-B/16 and ConvNeXt-T are torchvision's (seeded random weights: latency does not
depend on them), MobileNetV2
is torchvision's with its real ImageNet weights, and MiniLM-L6 is a BERT encoder built here and
loaded from the registry's ONNX file (int8 weights with per-column scales, dequantized as the graph
does), so that PyTorch and ONNX Runtime run the same network on the same inputs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn
from torch.nn import functional

from benchmarks.models import minilm_onnx
from gpt_optuna.testing.mobilenet_v2 import WEIGHTS, load_state_dict
from gpt_optuna.testing.registry import download_one

BATCH = 8
SEQUENCE = 128


def _seeded(make: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return make().eval()


def resnet50() -> nn.Module:
    import torchvision

    return _seeded(lambda: torchvision.models.resnet50(weights=None))


def vit_b_16() -> nn.Module:
    """torchvision's ViT-B/16; its classifier, which torchvision starts at zero, seeded like the rest
    (zero logits would make every accuracy comparison meaningless)."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.vit_b_16(weights=None).eval()
    nn.init.normal_(model.heads.head.weight, std=0.02)
    return model


def convnext_tiny() -> nn.Module:
    import torchvision

    return _seeded(lambda: torchvision.models.convnext_tiny(weights=None))


def mobilenet_v2() -> nn.Module:
    import torchvision

    model = torchvision.models.mobilenet_v2(weights=None)
    state = {name: torch.from_numpy(np.array(value)) for name, value in load_state_dict(download_one(*WEIGHTS)).items()}
    model.load_state_dict(state)
    return model.eval()


class _Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, inner: int) -> None:
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.attention_out = nn.Linear(hidden, hidden)
        self.attention_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.intermediate = nn.Linear(hidden, inner)
        self.output = nn.Linear(inner, hidden)
        self.output_norm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, length, self.heads, hidden // self.heads).transpose(1, 2)

        attended = functional.scaled_dot_product_attention(
            split(self.query(x)), split(self.key(x)), split(self.value(x)), attn_mask=keep
        )
        x = self.attention_norm(x + self.attention_out(attended.transpose(1, 2).reshape(batch, length, hidden)))
        return self.output_norm(x + self.output(functional.gelu(self.intermediate(x))))


class MiniLM(nn.Module):
    """A BERT encoder: token, position and type embeddings, then post-norm layers."""

    def __init__(self, vocab: int = 30522, hidden: int = 384, layers: int = 6, heads: int = 12) -> None:
        super().__init__()
        self.words = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(512, hidden)
        self.types = nn.Embedding(2, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(_Layer(hidden, heads, 4 * hidden) for _ in range(layers))

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.norm(self.words(input_ids) + self.types(token_type_ids) + self.positions(positions)[None])
        keep = attention_mask.bool()[:, None, None, :]
        for layer in self.layers:
            x = layer(x, keep)
        return x


def minilm() -> nn.Module:
    """MiniLM with the ONNX file's weights: embeddings and biases by name, the 36 weight matrices
    in graph order (query, key, value, attention output, intermediate, output per layer)."""
    graph = onnx.load(str(minilm_onnx())).graph
    arrays = {t.name: numpy_helper.to_array(t) for t in graph.initializer}

    def weight(name: str) -> np.ndarray:
        return arrays[f"{name}_q"].astype(np.float32) * arrays[f"{name}_scale"]

    model = MiniLM().eval()
    matrices = [node.input[1] for node in graph.node if node.op_type == "MatMul" and f"{node.input[1]}_q" in arrays]
    state: dict[str, np.ndarray] = {
        "words.weight": weight("inner.embeddings.word_embeddings.weight"),
        "positions.weight": weight("inner.embeddings.position_embeddings.weight"),
        "types.weight": arrays["inner.embeddings.token_type_embeddings.weight"],
        "norm.weight": arrays["inner.embeddings.LayerNorm.weight"],
        "norm.bias": arrays["inner.embeddings.LayerNorm.bias"],
    }
    ours = ("query", "key", "value", "attention_out", "intermediate", "output")
    theirs = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense")
    theirs += ("intermediate.dense", "output.dense")
    for index in range(len(model.layers)):
        prefix = f"inner.encoder.layer.{index}"
        for k, (mine, source) in enumerate(zip(ours, theirs, strict=True)):
            state[f"layers.{index}.{mine}.weight"] = weight(matrices[6 * index + k]).T
            if f"{prefix}.{source}.bias" in arrays:
                state[f"layers.{index}.{mine}.bias"] = arrays[f"{prefix}.{source}.bias"]
        for mine, source in (("attention_norm", "attention.output.LayerNorm"), ("output_norm", "output.LayerNorm")):
            state[f"layers.{index}.{mine}.weight"] = arrays[f"{prefix}.{source}.weight"]
            state[f"layers.{index}.{mine}.bias"] = arrays[f"{prefix}.{source}.bias"]
    model.load_state_dict({name: torch.from_numpy(np.array(v, np.float32)) for name, v in state.items()})
    return model


def token_inputs(seed: int = 0) -> dict[str, np.ndarray]:
    """A batch of token ids with some padding at the ends of the rows."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 30000, (BATCH, SEQUENCE), dtype=np.int64)
    lengths = rng.integers(SEQUENCE // 2, SEQUENCE + 1, BATCH)
    mask = (np.arange(SEQUENCE)[None] < lengths[:, None]).astype(np.int64)
    return {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


# The family benchmark: architectures from torchvision, timm and transformers, seeded random
# weights (latency does not depend on them), each returning one tensor.


def efficientnet_b0() -> nn.Module:
    import torchvision

    return _seeded(lambda: torchvision.models.efficientnet_b0(weights=None))


class _Out(nn.Module):
    """A segmentation model's ``out`` map (torchvision's segmentation models return a dict)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)["out"]


def deeplabv3_mobilenet() -> nn.Module:
    import torchvision

    return _seeded(
        lambda: _Out(torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None))
    )


def swin_t() -> nn.Module:
    import torchvision

    return _seeded(lambda: torchvision.models.swin_t(weights=None))


def convnextv2_tiny() -> nn.Module:
    """timm's ConvNeXt V2 (global response normalization)."""
    import timm

    return _seeded(lambda: timm.create_model("convnextv2_tiny", pretrained=False))


def mobilevit_s() -> nn.Module:
    """timm's MobileViT-S, a mobile hybrid of convolutions and transformer blocks."""
    import timm

    return _seeded(lambda: timm.create_model("mobilevit_s", pretrained=False))


class _Hidden(nn.Module):
    """A ``transformers`` model's last hidden state from token ids and a padding mask."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state


def _hidden(make: Callable[[], nn.Module]) -> nn.Module:
    return _seeded(lambda: _Hidden(make()))


def bert_base() -> nn.Module:
    import transformers

    return _hidden(lambda: transformers.BertModel(transformers.BertConfig(), add_pooling_layer=False))


def gpt2() -> nn.Module:
    """GPT-2 small, its causal mask built by the library."""
    import transformers

    return _hidden(lambda: transformers.GPT2Model(transformers.GPT2Config()))


def llama() -> nn.Module:
    """A Llama-style decoder of 490 MB: RMSNorm, rotary embeddings, 16 query heads over 4 K/V heads."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=4,
    )
    return _hidden(lambda: transformers.LlamaModel(config))


def decoder_inputs(seed: int = 0) -> dict[str, np.ndarray]:
    """Token ids (below every vocabulary's size here) and a padding mask, without token types."""
    inputs = token_inputs(seed)
    return {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}


def with_batch_statistics(make: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    """``make``'s model with its batch norms' running statistics measured on N(0, 1) images (four
    batches other than the benchmark's). Seeded weights keep torch's initial statistics (mean 0,
    variance 1), with which activations grow or vanish through the depth: EfficientNet-B0's logits
    come out near 1e-14, below fp16's range, so no fp16 engine of it could be judged; measured
    statistics keep every block's activations near unit scale, as trained ones do."""

    def calibrated() -> nn.Module:
        model = make()
        norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        for norm in norms:
            norm.reset_running_stats()
            norm.momentum = None  # a cumulative average over the batches
        model.train()
        with torch.no_grad():
            for seed in range(1, 5):
                model(torch.from_numpy(noise_images(seed)["x"]))
        return model.eval()

    return calibrated


def noise_images(seed: int = 0) -> dict[str, np.ndarray]:
    """A batch of N(0, 1) images at 224x224 (the weights are random too: nothing to recognise)."""
    return {"x": np.random.default_rng(seed).standard_normal((BATCH, 3, 224, 224), dtype=np.float32)}
