// config/doc.h - the key table as documentation.
#ifndef DSC_CONFIG_DOC_H
#define DSC_CONFIG_DOC_H

// Write every row of keys.def as a markdown table to `out` (a FILE*).
void dsc__config_write_doc(void *out);

#endif
