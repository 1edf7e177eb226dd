"""The LLMEndpoint API: typed spec and status models, and the CRD generated from them."""

from kvscale.api.status import Condition, LLMEndpointStatus
from kvscale.api.v1alpha1 import GROUP, KIND, PLURAL, VERSION, LLMEndpointSpec

__all__ = [
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "Condition",
    "LLMEndpointSpec",
    "LLMEndpointStatus",
]
