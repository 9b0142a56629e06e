"""The declaration (cmake/knobs.json, installed as the package root's knobs.json) and the build
record (build_info.json), read: the knobs' words and head dims (knob_values), the families and
how each is built (families, family_build, cuda_archs, json_types), the kernels a build holds
(kernels), the op schemas and the version scheme (versioning). No torch at import: CMake's
configure and the version provider run these modules.
"""
