"""The packaged templates (installed as ``codegen_templates``): one Jinja2 template per generated
module, and a family's context file beside its template where it needs one.  Not imported at run
time; the compiler finds the folder through this package."""
