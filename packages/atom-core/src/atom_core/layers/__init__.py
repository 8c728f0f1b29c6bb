"""Building blocks of ATOM's models: TP- and quantization-aware linear layers, norms, rotary
embeddings, activations, embeddings."""
