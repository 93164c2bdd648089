"""Write a sharding sidecar (docs/sharding-file.md, minimal form) with one tensor per line."""
import json


def write(path, mesh_shape, mesh_axes, tensors):
    lines = ["{", f'  "mesh": {{"shape": {json.dumps(mesh_shape)}, "axes": {json.dumps(mesh_axes)}}},',
             '  "tensors": {']
    items = list(tensors.items())
    for i, (k, v) in enumerate(items):
        lines.append(f"    {json.dumps(k)}: {json.dumps(v)}" + ("," if i + 1 < len(items) else ""))
    lines += ["  }", "}"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(path) as f:  # must round-trip
        assert json.load(f) == {"mesh": {"shape": mesh_shape, "axes": mesh_axes}, "tensors": tensors}


def megatron_layer_specs(prefix, layers):
    """Megatron tensor parallelism over mesh axis "model" for the blocks <prefix><i>.: q/k/v and fc_in split on
    output features (weights [in, out], biases too), attn.proj and fc_out split on input features."""
    t = {}
    for i in range(layers):
        p = f"{prefix}{i}."
        for m in ("q", "k", "v"):
            t[p + f"attn.{m}.weight"] = [None, "model"]
            t[p + f"attn.{m}.bias"] = ["model"]
        t[p + "attn.proj.weight"] = ["model", None]
        t[p + "mlp.fc_in.weight"] = [None, "model"]
        t[p + "mlp.fc_in.bias"] = ["model"]
        t[p + "mlp.fc_out.weight"] = ["model", None]
    return t
