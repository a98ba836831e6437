/* Text from files as the CLI shows it (text.c). */
#ifndef DT_CLI_TEXT_H
#define DT_CLI_TEXT_H
/* Length (2-4) of the UTF-8 sequence at s when it is one: the shortest form
 * of a Unicode scalar value other than U+FFFE / U+FFFF (the characters
 * XML 1.0 can hold); 0 when not (ASCII included: the callers' concern). */
int dt_cli_utf8_len(const unsigned char *s);
/* s safe to print on a terminal: C0 controls, DEL and bytes that are not
 * UTF-8 as \xNN (ESC: \x1b, a newline: \x0a), C1 controls as \u0080..\u009f,
 * a backslash as \\; the rest as it is. malloc'd; NULL when out of memory. */
char *dt_cli_escape(const char *s);
#endif
