"""Pure ONNX work, in any process: the model's description and feeds, and the graph transforms a
candidate may ask for (fusion, attention rewrite, fp16/bf16, int8/fp8, opset, folding), each made
once per content key and checked against the model's interface."""
