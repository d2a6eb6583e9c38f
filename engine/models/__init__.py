"""Native model implementations, loaded straight from HF config.json + safetensors."""
