"""Weight quantization: one `QuantMethod` per format, chosen once at load (`resolve_quant_method`)."""
