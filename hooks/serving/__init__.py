"""The hooks process's edge: the Flask app routing every sync hook and admission webhook, and the
gunicorn server that runs it. It sits above both `praesto.hooks` (the Metacontroller hooks) and
`praesto.hooks.admission`, so neither imports the other's caller."""
