"""nanoGPT-style example: one small GPT, two attentions (the seed's manual three lines, flashgen).

The modules here run as scripts (`python examples/nanogpt/train.py ...`) and import each other
as siblings then; this file lets tests import them as a package too.
"""
