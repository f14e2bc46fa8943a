/* JSON of shapes and error reports (report_json.h). */
#include "common/report_json.h"

#include <cjson/cJSON.h>
#include <math.h>

cJSON *qd_shape_json(int ndim, const int64_t *shape)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < ndim; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((double)shape[i]));
    return a;
}

cJSON *qd_report_json(const struct qd_error_report *r)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "nmse", r->nmse);
    if (isfinite(r->sqnr_db))
        cJSON_AddNumberToObject(e, "sqnr_db", r->sqnr_db);
    else
        cJSON_AddNullToObject(e, "sqnr_db"); /* exact round trip */
    cJSON_AddNumberToObject(e, "max_abs", r->max_abs);
    return e;
}
