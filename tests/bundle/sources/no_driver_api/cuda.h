/* Shadows the driver API's cuda.h on the include path of a launcher that must not need it
   (a bundle without wgmma variants): including it is a compile error. */
#error "this launcher includes cuda.h, but a bundle without tensor maps needs no driver API"
