/** The OpenAPI security schemes: a tenant's key, and the operators' admin key. */
export const TENANT_KEY_AUTH = 'tenant-key';
export const ADMIN_KEY_AUTH = 'admin-key';
