"""Settings of the HTTP server around the engine, validated once at the edge."""

from __future__ import annotations

from dataclasses import dataclass

from kvscale_engine.config import ConfigError
from kvscale_engine.server.admission import AdmissionConfigError, TrafficClass

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
    shutdown_grace_s: float = 5.0  # after SIGTERM: serve while endpoints stop sending, then drain
    admin_port: int | None = None  # where /drain and /undrain are answered; None: nowhere
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
        if self.shutdown_grace_s < 0:
            raise ConfigError(f"shutdown grace must be >= 0, got {self.shutdown_grace_s}")
        if self.admin_port is not None and not 1 <= self.admin_port <= 65535:
            raise ConfigError(f"admin port must be in [1, 65535], got {self.admin_port}")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"max body size must be >= 1024 bytes, got {self.max_body_bytes}")
        if not self.traffic_classes:
            object.__setattr__(self, "traffic_classes", (TrafficClass(),))

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.traffic_classes)
