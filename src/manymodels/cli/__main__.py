from .app import app

app(prog_name="manymodels")
