"""A loaded model: config, weights, tokenizer and chat template from one GGUF file."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..weights.gguf_file import GGUFFile
from .chat import chat_template_for
from .config import ModelConfig
from .decoder import Decoder
from .tokenizer import Tokenizer
from .weights import ModelWeights, load_weights


@dataclass
class Model:
    path: Path
    file: GGUFFile
    cfg: ModelConfig
    weights: ModelWeights
    tokenizer: Tokenizer
    chat_template: str | None

    @property
    def decoder(self) -> Decoder:
        return Decoder(self.cfg, self.weights)


def load_model(path: str | os.PathLike) -> Model:
    f = GGUFFile(path)
    cfg = ModelConfig.from_gguf(f)
    weights = load_weights(f, cfg)
    tok = Tokenizer.from_gguf(f.metadata)
    return Model(Path(path), f, cfg, weights, tok, chat_template_for(f.metadata))
