"""Write a sharding sidecar (docs/SHARDING_FILE.md, minimal form) with one tensor per line."""
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
