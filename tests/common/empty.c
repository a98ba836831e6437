/* keeps dt_testutil non-empty */
typedef int dt_testutil_empty_unit;
