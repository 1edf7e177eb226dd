"""Settings of the HTTP server around the engine, validated once at the edge."""

from __future__ import annotations

from dataclasses import dataclass

from kvscale_engine.admission import AdmissionConfigError, TrafficClass
from kvscale_engine.config import ConfigError

CLASS_HEADER = "x-kvscale-class"


@dataclass(frozen=True)
class ServerConfig:
    served_model_name: str
    max_model_len: int
    max_num_seqs: int = 256
    traffic_classes: tuple[TrafficClass, ...] = (TrafficClass(),)
    admission: bool = True
    max_concurrency: int | None = None  # None: derived from the KV budget and max_model_len
    drain_timeout_s: float = 30.0
    max_body_bytes: int = 4 * 1024 * 1024
    engine_label: str = "0"
    warmup: bool = True

    def __post_init__(self) -> None:
        if not self.served_model_name:
            raise ConfigError("served model name must not be empty")
        if self.max_model_len < 2:
            raise ConfigError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise AdmissionConfigError(f"max concurrency must be >= 1, got {self.max_concurrency}")
        if self.drain_timeout_s < 0:
            raise ConfigError(f"drain timeout must be >= 0, got {self.drain_timeout_s}")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"max body size must be >= 1024 bytes, got {self.max_body_bytes}")
        if not self.traffic_classes:
            object.__setattr__(self, "traffic_classes", (TrafficClass(),))

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.traffic_classes)
