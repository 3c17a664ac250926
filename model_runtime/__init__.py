"""ONNX Runtime sessions, the model store and cross-call batching.

Empty until the speech-agent issue lands; it must never know about SIP.
"""
