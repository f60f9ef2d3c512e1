"""Models: what a model name means, the files it resolves to, and one module per architecture.

Kept free of imports so that importing one of its modules (the config, the weight reader) does not load
every architecture with it.
"""
