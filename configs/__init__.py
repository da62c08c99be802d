"""The Hydra config tree of bftrec-train (configs/ in the checkout, bftrec/configs/ when installed).

A package only so that Hydra finds it on the search path ``pkg://bftrec.configs`` (Hydra needs this
file); it holds no code.
"""
