"""glm-operator: serve GLM-family (and any GGUF / Hugging Face) models on Kubernetes."""

__version__ = "0.1.0"
