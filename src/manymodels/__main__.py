from manymodels.cli import app

app()
