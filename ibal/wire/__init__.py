"""Wire formats shared by providers and subsystems: field tables and packet capture."""
