"""The gateway against the real llama-swap binary (see ``test_real_llama_swap``)."""
