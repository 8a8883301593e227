"""Triton Python-backend model doing business logic scripting (BLS): z = double(matmul(x)),
each step an inference request of its own sent from ``execute`` to the models ``matmul`` and
``double``.

The child requests carry the request's trace (``trace=request.trace()``, as Triton's trace
docs ask for BLS), so they are traced under it; a request with the parameter
``"bls_trace": false`` sends them without it, as BLS code written before that argument does.
"""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            params = json.loads(r.parameters() or "{}")
            trace = r.trace() if params.get("bls_trace", True) else None
            x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
            y = self._infer("matmul", pb_utils.Tensor("x", x), "y", trace)
            z = self._infer("double", pb_utils.Tensor("y", y), "z", trace)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("z", z)]))
        return out

    def _infer(self, model, tensor, output, trace):
        kwargs = {} if trace is None else {"trace": trace}
        response = pb_utils.InferenceRequest(
            model_name=model, requested_output_names=[output], inputs=[tensor], **kwargs
        ).exec()
        if response.has_error():
            raise pb_utils.TritonModelException(response.error().message())
        return pb_utils.get_output_tensor_by_name(response, output).as_numpy()
