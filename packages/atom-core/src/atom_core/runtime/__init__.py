"""ATOM's native host: a paged KV cache, a batch runner and a sampler, so a model can be run, tested
and benchmarked with no serving framework installed."""
