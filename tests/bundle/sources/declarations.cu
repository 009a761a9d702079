// A kernel's definition, then the launcher's declaration(s) of it: redeclaring an extern "C"
// function with other parameters is a compile error, so this translation unit compiles only if
// they are equal (the linker would not tell: C symbols carry no types). Placeholders: KERNEL,
// the kernel file's name; DECLARATIONS, the launcher's declarations.
#include "kernels/@KERNEL@.cu"
@DECLARATIONS@
